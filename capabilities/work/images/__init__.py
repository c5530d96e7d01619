"""process.image: Pillow with decoding limits."""
