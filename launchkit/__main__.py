from launchkit.cli import run

run()
