"""Validators: compare candidates with their baseline and measure them."""
