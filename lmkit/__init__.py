"""lmkit."""
