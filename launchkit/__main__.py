from launchkit.cli import main

main()
