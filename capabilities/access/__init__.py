"""Who may connect and what they may hold: agent keys, page tokens, origins, rate limits."""
