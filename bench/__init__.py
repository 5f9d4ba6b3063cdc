"""streampool's benchmark: `make bench` (or `python -m bench.run`) writes bench/results.json and renders
bench/RESULTS.md from it."""
