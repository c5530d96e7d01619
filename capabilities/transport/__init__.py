"""The Daphne side: the ABP WebSocket consumer and its ASGI guards."""
