"""teachkit."""
