"""streampool's benchmark: `make bench` (or `python -m bench.run`) writes bench/RESULTS.md."""
