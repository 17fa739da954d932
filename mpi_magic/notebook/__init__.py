"""The notebook's side of a run: what a cell captures and sends, the one cell pipeline that
submits, follows and collects it, sessions, and the job handle. No IPython shell in here."""
