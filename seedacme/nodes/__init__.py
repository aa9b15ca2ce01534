"""The Launchpad nodes and their assembly into a program: the central node, its report
intake, its supervised process, the replay node, make_program.
"""
