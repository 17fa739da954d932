"""The code that runs on every rank. It imports nothing from IPython or the view."""
