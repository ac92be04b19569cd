"""Built-in models (one folder each) and the code that loads any model."""
