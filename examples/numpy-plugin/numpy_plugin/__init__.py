"""A plain-numpy Flower app that uses fedx's FedMR in place of FedAvg."""
