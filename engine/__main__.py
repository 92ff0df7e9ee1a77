from engine.cli.main import main_exit

main_exit()
