from megapilot.cli.app import main

main()
