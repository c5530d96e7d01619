"""The sans-I/O session: ABP messages and facts in, actions out. No socket, no database."""
