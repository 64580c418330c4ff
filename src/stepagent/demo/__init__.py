"""The offline demo of ``stepagent run``: a scripted model and the tools it calls."""
