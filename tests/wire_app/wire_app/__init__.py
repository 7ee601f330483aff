"""A numpy-only Flower app that runs fedx strategies over real SuperNodes."""
