"""`python -m cli <command>`: the `streampool` command without its installed script."""

from cli.main import main

main()
