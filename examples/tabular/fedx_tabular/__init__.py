"""A data set and a model of one's own for the fedx app.

The data set (:data:`fedx_tabular.data.WDBC`) is the Wisconsin breast-cancer
diagnoses, 30 measurements of a cell sample and whether it is malignant or
benign, read from two CSV files (``python -m fedx_tabular.prepare <folder>``
writes them from the copy that ships inside scikit-learn). The model
(:func:`fedx_tabular.model.build_mlp`) is a small multi-layer perceptron.
Neither imports anything of fedx's app: fedx partitions the rows among its
clients, trains the model with its methods and evaluates it.
"""
