from stormguard_server.drill.cli import main

main()
