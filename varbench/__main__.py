"""`python -m varbench ...`: the command (`varbench.cli.app`)."""
from varbench.cli.app import cli

if __name__ == "__main__":
    cli()
