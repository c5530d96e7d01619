"""The call service every front door uses: start, cancel, resume, end a session's calls."""
