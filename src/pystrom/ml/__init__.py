"""Machine learning on pystrom data: logistic regression fitted by IRLS on the GPU (or the CPU).

>>> from pystrom.ml import LogisticRegression
>>> model = LogisticRegression().fit(table, columns=["x1", "x2"], target="y")
>>> print(model.summary())
"""

from ._irls import ConvergenceWarning, NumericalWarning, PerfectSeparationWarning
from .logistic import LogisticRegression
from .madlib import logregr_predict, logregr_predict_prob, logregr_train

__all__ = [
    "LogisticRegression",
    "logregr_train",
    "logregr_predict",
    "logregr_predict_prob",
    "PerfectSeparationWarning",
    "ConvergenceWarning",
    "NumericalWarning",
]
