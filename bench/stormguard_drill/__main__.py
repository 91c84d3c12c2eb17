from stormguard_drill.cli import main

main()
