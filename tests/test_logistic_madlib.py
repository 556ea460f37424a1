"""MADlib's own logistic-regression checks, run against pystrom's ``logregr_*`` at MADlib's defaults.

Data and assertions typed from apache/madlib (public reference, not our code):
``src/ports/postgres/modules/regress/test/logistic.sql_in`` (the install check: patients, crime,
grad_school) and the user documentation's example in ``src/ports/postgres/modules/regress/logistic.sql_in``
(patients, printed results). MADlib's ``relative_error`` of arrays is ||a - b|| / ||b|| (utilities.sql_in).
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from pystrom import Table
from pystrom.ml import logregr_predict, logregr_predict_prob, logregr_train


def relative_error(approx, value) -> float:
    approx, value = np.atleast_1d(np.asarray(approx, dtype=float)), np.atleast_1d(np.asarray(value, dtype=float))
    return float(np.linalg.norm(approx - value) / np.linalg.norm(value))


def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


# -- patients (install check: 23 rows, three with a NULL) ----------------------------------------

# id, second_attack, treatment, trait_anxiety (None = NULL)
PATIENTS = [
    (0, None, 1, 70), (1, 1, 1, 70), (2, 1, 1, 80), (3, 1, 1, 50), (4, 1, 0, 60), (5, 1, 0, 40), (6, 1, 0, 65),
    (7, 1, 0, 75), (8, 1, 0, 80), (9, 1, 0, 70), (10, 1, 0, 60), (11, 0, 1, 65), (12, 0, 1, 50), (13, 0, 1, 45),
    (14, 0, 1, 35), (15, 0, 1, 40), (16, 0, 1, 50), (17, 0, 0, 55), (18, 0, 0, 45), (19, 0, 0, 50), (20, 0, 0, 60),
    (21, 0, 0, None), (22, 0, None, 60),
]  # fmt: skip


def patients(device: str, with_nulls: bool = True) -> Table:
    rows = PATIENTS if with_nulls else [r for r in PATIENTS if None not in r]
    cols = list(zip(*rows))
    names = ["id", "second_attack", "treatment", "trait_anxiety"]
    return Table.from_arrow(pa.table({n: pa.array(c, type=pa.int32()) for n, c in zip(names, cols)}), device=device)


def assert_patients_install_check(m) -> None:
    assert relative_error(m.coefficients_, [-6.36, -1.02, 0.119]) < 1e-3
    assert relative_error(m.log_likelihood_, -9.41) < 1e-3
    assert relative_error(m.std_err_, [3.21, 1.17, 0.0550]) < 0.002
    assert relative_error(m.z_stats_, [-1.98, -0.874, 2.17]) < 0.002
    assert relative_error(m.p_values_, [0.0477, 0.382, 0.0304]) < 1e-3
    assert relative_error(m.odds_ratios_, [0.00172, 0.359, 1.13]) < 0.004
    assert relative_error(m.condition_no_, math.sqrt(106329)) < 1e-2
    assert m.num_rows_processed_ == 20
    assert m.num_missing_rows_skipped_ == 3


def test_install_check_patients(device):
    # select logregr_train('patients', 'temp_result', 'second_attack', 'ARRAY[1, treatment, trait_anxiety]',
    #                      Null, 20, 'irls')
    m = logregr_train(patients(device), "second_attack", "ARRAY[1, treatment, trait_anxiety]", 20)
    assert_patients_install_check(m)


# The documentation's printout (PostgreSQL prints 15 significant digits). Our values agree with it to
# 2e-13 relative (13 digits; the odds ratio exp(-6.36) amplifies its coefficient's error 6.4 times): the
# last one or two printed digits are float64 rounding in MADlib's Eigen arithmetic (X^T A X has
# condition number 1.06e5). Evaluated in 50-digit arithmetic, MADlib's five iterations give
# coef[0] = -6.363469941781796, std_err[0] = 3.2138976637509305, condition_no = 326.08192279156976:
# pystrom prints -6.36346994178179(6), 3.21389766375092 and 326.081922791566, MADlib
# -6.36346994178192, 3.21389766375099 and 326.081922791575.
DOC_PRINTED = {
    "coefficients_": [-6.36346994178192, -1.02410605239327, 0.119044916668607],
    "log_likelihood_": -9.41018298388876,
    "std_err_": [3.21389766375099, 1.17107844860319, 0.0549790458269317],
    "z_stats_": [-1.97998524145757, -0.874498248699539, 2.16527796868916],
    "p_values_": [0.0477051870698145, 0.381846973530455, 0.0303664045046183],
    "odds_ratios_": [0.00172337630923221, 0.359117354054956, 1.12642051220895],
    "condition_no_": 326.081922791575,
}
DOC_VCOV_FIRST_ROW = [10.329138193064, -0.474304665195738, -0.171995901260057]
DOC_PREDICT = "ttftfttttttffffftfft"  # ids 1..20
DOC_PREDICT_PROB = [
    0.720223028941527, 0.894354902502048, 0.192269541755171, 0.685513072239347, 0.167747881508857,
    0.79809810891514, 0.928568075752503, 0.959305763693571, 0.877576117431452, 0.685513072239347,
    0.586700895943317, 0.192269541755171, 0.116032010632994, 0.0383829143134982, 0.0674976224147597,
    0.192269541755171, 0.545870774302621, 0.267675422387132, 0.398618639285111, 0.685513072239347,
]  # fmt: skip


def test_docs_example_patients(device):
    table = patients(device, with_nulls=False)
    m = logregr_train(table, "second_attack", "ARRAY[1, treatment, trait_anxiety]", 20)
    digits = 2e-13 if device == "cpu" else 1e-12  # the GPU sums the rows in another order
    for name, printed in DOC_PRINTED.items():
        np.testing.assert_allclose(getattr(m, name), printed, rtol=digits, err_msg=name)
    np.testing.assert_allclose(m.variance_covariance_[0], DOC_VCOV_FIRST_ROW, rtol=digits)
    assert (m.num_rows_processed_, m.num_missing_rows_skipped_, m.n_iter_) == (20, 0, 5)
    assert m.converged_ and m.separation_ is None
    independent = "ARRAY[1, treatment, trait_anxiety]"
    pred = _host(logregr_predict(m.coefficients_, table, independent))
    assert "".join("t" if v else "f" for v in pred) == DOC_PREDICT
    prob = _host(logregr_predict_prob(m.coefficients_, table, independent))
    np.testing.assert_allclose(prob, DOC_PREDICT_PROB, rtol=digits)


# -- crime (install check; Stata's output for the same data) -------------------------------------

CRIME_COLUMNS = "crimerat maleteen south educ police60 police59 labor males pop nonwhite unemp1 unemp2 median belowmed"
CRIME = """
    79.1 151 1 9.1 58 56 510 950 33 301 108 41 394 261
    163.5 143 0 11.3 103 95 583 1012 13 102 96 36 557 194
    57.8 142 1 8.9 45 44 533 969 18 219 94 33 318 250
    196.9 136 0 12.1 149 141 577 994 157 80 102 39 673 167
    123.4 141 0 12.1 109 101 591 985 18 30 91 20 578 174
    68.2 121 0 11.0 118 115 547 964 25 44 84 29 689 126
    96.3 127 1 11.1 82 79 519 982 4 139 97 38 620 168
    155.5 131 1 10.9 115 109 542 969 50 179 79 35 472 206
    85.6 157 1 9.0 65 62 553 955 39 286 81 28 421 239
    70.5 140 0 11.8 71 68 632 1029 7 15 100 24 526 174
    167.4 124 0 10.5 121 116 580 966 101 106 77 35 657 170
    84.9 134 0 10.8 75 71 595 972 47 59 83 31 580 172
    51.1 128 0 11.3 67 60 624 972 28 10 77 25 507 206
    66.4 135 0 11.7 62 61 595 986 22 46 77 27 529 190
    79.8 152 1 8.7 57 53 530 986 30 72 92 43 405 264
    94.6 142 1 8.8 81 77 497 956 33 321 116 47 427 247
    53.9 143 0 11.0 66 63 537 977 10 6 114 35 487 166
    92.9 135 1 10.4 123 115 537 978 31 170 89 34 631 165
    75.0 130 0 11.6 128 128 536 934 51 24 78 34 627 135
    122.5 125 0 10.8 113 105 567 985 78 94 130 58 626 166
    74.2 126 0 10.8 74 67 602 984 34 12 102 33 557 195
    43.9 157 1 8.9 47 44 512 962 22 423 97 34 288 276
    121.6 132 0 9.6 87 83 564 953 43 92 83 32 513 227
    96.8 131 0 11.6 78 73 574 1038 7 36 142 42 540 176
    52.3 130 0 11.6 63 57 641 984 14 26 70 21 486 196
    199.3 131 0 12.1 160 143 631 1071 3 77 102 41 674 152
    34.2 135 0 10.9 69 71 540 965 6 4 80 22 564 139
    121.6 152 0 11.2 82 76 571 1018 10 79 103 28 537 215
    104.3 119 0 10.7 166 157 521 938 168 89 92 36 637 154
    69.6 166 1 8.9 58 54 521 973 46 254 72 26 396 237
    37.3 140 0 9.3 55 54 535 1045 6 20 135 40 453 200
    75.4 125 0 10.9 90 81 586 964 97 82 105 43 617 163
    107.2 147 1 10.4 63 64 560 972 23 95 76 24 462 233
    92.3 126 0 11.8 97 97 542 990 18 21 102 35 589 166
    65.3 123 0 10.2 97 87 526 948 113 76 124 50 572 158
    127.2 150 0 10.0 109 98 531 964 9 24 87 38 559 153
    83.1 177 1 8.7 58 56 638 974 24 349 76 28 382 254
    56.6 133 0 10.4 51 47 599 1024 7 40 99 27 425 225
    82.6 149 1 8.8 61 54 515 953 36 165 86 35 395 251
    115.1 145 1 10.4 82 74 560 981 96 126 88 31 488 228
    88.0 148 0 12.2 72 66 601 998 9 19 84 20 590 144
    54.2 141 0 10.9 56 54 523 968 4 2 107 37 489 170
    82.3 162 1 9.9 75 70 522 996 40 208 73 27 496 224
    103.0 136 0 12.1 95 96 574 1012 29 36 111 37 622 162
    45.5 139 1 8.8 46 41 480 968 19 49 135 53 457 249
    50.8 126 0 10.4 106 97 599 989 40 24 78 25 593 171
    84.9 130 0 12.1 90 91 623 1049 3 22 113 40 588 160
"""


def crime(device: str) -> Table:
    values = np.array([[float(v) for v in line.split()] for line in CRIME.strip().splitlines()])
    cols = {n: values[:, j] for j, n in enumerate(CRIME_COLUMNS.split())}
    cols["high"] = cols["crimerat"] >= 110  # the dependent expression 'crimerat >= 110'
    for n in ["maleteen", "south", "police60", "police59"]:
        cols[n] = cols[n].astype(np.int32)  # INTEGER / SMALLINT columns
    return Table.from_arrays(cols, device=device)


def test_install_check_crime(device):
    # select logregr_train('crime', 'temp_result', 'crimerat >= 110', 'array[1, maleteen, south, educ, police59]')
    m = logregr_train(crime(device), "high", "array[1, maleteen, south, educ, police59]")
    assert relative_error(m.coefficients_, [-17.70177, 0.0833837, -1.117091, 0.0229224, 0.0581834]) < 1e-5
    assert relative_error(m.log_likelihood_, -18.606959) < 1e-5
    assert relative_error(m.std_err_, [9.495993, 0.0440353, 1.359616, 0.5594047, 0.0210049]) < 1e-5
    assert relative_error(m.z_stats_, [-1.864, 1.894, -0.822, 0.041, 2.770]) < 1e-3
    assert relative_error(m.p_values_, [0.062, 0.058, 0.411, 0.967, 0.006]) < 1e-3
    odds = [math.exp(-17.70177), 1.086959, 0.3272305, 1.023187, 1.059909]
    assert relative_error(m.odds_ratios_, odds) < 1e-5
    assert relative_error(m.condition_no_, math.sqrt(14513863)) < 1e-2


# -- grad_school (install check; UCLA's R example) -----------------------------------------------

# admit, gre, gpa, rank
GRAD_SCHOOL = """
    0,380,3.61,3  1,660,3.67,3  1,800,4,1  1,640,3.19,4  0,520,2.93,4  1,760,3,2  1,560,2.98,1  0,400,3.08,2
    1,540,3.39,3  0,700,3.92,2  0,800,4,4  0,440,3.22,1  1,760,4,1  0,700,3.08,2  1,700,4,1  0,480,3.44,3
    0,780,3.87,4  0,360,2.56,3  0,800,3.75,2  1,540,3.81,1  0,500,3.17,3  1,660,3.63,2  0,600,2.82,4  0,680,3.19,4
    1,760,3.35,2  1,800,3.66,1  1,620,3.61,1  1,520,3.74,4  1,780,3.22,2  0,520,3.29,1  0,540,3.78,4  0,760,3.35,3
    0,600,3.4,3  1,800,4,3  0,360,3.14,1  0,400,3.05,2  0,580,3.25,1  0,520,2.9,3  1,500,3.13,2  1,520,2.68,3
    0,560,2.42,2  1,580,3.32,2  1,600,3.15,2  0,500,3.31,3  0,700,2.94,2  1,460,3.45,3  1,580,3.46,2  0,500,2.97,4
    0,440,2.48,4  0,400,3.35,3  0,640,3.86,3  0,440,3.13,4  0,740,3.37,4  1,680,3.27,2  0,660,3.34,3  1,740,4,3
    0,560,3.19,3  0,380,2.94,3  0,400,3.65,2  0,600,2.82,4  1,620,3.18,2  0,560,3.32,4  0,640,3.67,3  1,680,3.85,3
    0,580,4,3  0,600,3.59,2  0,740,3.62,4  0,620,3.3,1  0,580,3.69,1  0,800,3.73,1  0,640,4,3  0,300,2.92,4
    0,480,3.39,4  0,580,4,2  0,720,3.45,4  0,720,4,3  0,560,3.36,3  1,800,4,3  0,540,3.12,1  1,620,4,1
    0,700,2.9,4  0,620,3.07,2  0,500,2.71,2  0,380,2.91,4  1,500,3.6,3  0,520,2.98,2  0,600,3.32,2  0,600,3.48,2
    0,700,3.28,1  1,660,4,2  0,700,3.83,2  1,720,3.64,1  0,800,3.9,2  0,580,2.93,2  1,660,3.44,2  0,660,3.33,2
    0,640,3.52,4  0,480,3.57,2  0,700,2.88,2  0,400,3.31,3  0,340,3.15,3  0,580,3.57,3  0,380,3.33,4  0,540,3.94,3
    1,660,3.95,2  1,740,2.97,2  1,700,3.56,1  0,480,3.13,2  0,400,2.93,3  0,480,3.45,2  0,680,3.08,4  0,420,3.41,4
    0,360,3,3  0,600,3.22,1  0,720,3.84,3  0,620,3.99,3  1,440,3.45,2  0,700,3.72,2  1,800,3.7,1  0,340,2.92,3
    1,520,3.74,2  1,480,2.67,2  0,520,2.85,3  0,500,2.98,3  0,720,3.88,3  0,540,3.38,4  1,600,3.54,1  0,740,3.74,4
    0,540,3.19,2  0,460,3.15,4  1,620,3.17,2  0,640,2.79,2  0,580,3.4,2  0,500,3.08,3  0,560,2.95,2  0,500,3.57,3
    0,560,3.33,4  0,700,4,3  0,620,3.4,2  1,600,3.58,1  0,640,3.93,2  1,700,3.52,4  0,620,3.94,4  0,580,3.4,3
    0,580,3.4,4  0,380,3.43,3  0,480,3.4,2  0,560,2.71,3  1,480,2.91,1  0,740,3.31,1  1,800,3.74,1  0,400,3.38,2
    1,640,3.94,2  0,580,3.46,3  0,620,3.69,3  1,580,2.86,4  0,560,2.52,2  1,480,3.58,1  0,660,3.49,2  0,700,3.82,3
    0,600,3.13,2  0,640,3.5,2  1,700,3.56,2  0,520,2.73,2  0,580,3.3,2  0,700,4,1  0,440,3.24,4  0,720,3.77,3
    0,500,4,3  0,600,3.62,3  0,400,3.51,3  0,540,2.81,3  0,680,3.48,3  1,800,3.43,2  0,500,3.53,4  1,620,3.37,2
    0,520,2.62,2  1,620,3.23,3  0,620,3.33,3  0,300,3.01,3  0,620,3.78,3  0,500,3.88,4  0,700,4,2  1,540,3.84,2
    0,500,2.79,4  0,800,3.6,2  0,560,3.61,3  0,580,2.88,2  0,560,3.07,2  0,500,3.35,2  1,640,2.94,2  0,800,3.54,3
    0,640,3.76,3  0,380,3.59,4  1,600,3.47,2  0,560,3.59,2  0,660,3.07,3  1,400,3.23,4  0,600,3.63,3  0,580,3.77,4
    0,800,3.31,3  1,580,3.2,2  1,700,4,1  0,420,3.92,4  1,600,3.89,1  1,780,3.8,3  0,740,3.54,1  1,640,3.63,1
    0,540,3.16,3  0,580,3.5,2  0,740,3.34,4  0,580,3.02,2  0,460,2.87,2  0,640,3.38,3  1,600,3.56,2  1,660,2.91,3
    0,340,2.9,1  1,460,3.64,1  0,460,2.98,1  1,560,3.59,2  0,540,3.28,3  0,680,3.99,3  1,480,3.02,1  0,800,3.47,3
    0,800,2.9,2  1,720,3.5,3  0,620,3.58,2  0,540,3.02,4  0,480,3.43,2  1,720,3.42,2  0,580,3.29,4  0,600,3.28,3
    0,380,3.38,2  0,420,2.67,3  1,800,3.53,1  0,620,3.05,2  1,660,3.49,2  0,480,4,2  0,500,2.86,4  0,700,3.45,3
    0,440,2.76,2  1,520,3.81,1  1,680,2.96,3  0,620,3.22,2  0,540,3.04,1  0,800,3.91,3  0,680,3.34,2  0,440,3.17,2
    0,680,3.64,3  0,640,3.73,3  0,660,3.31,4  0,620,3.21,4  1,520,4,2  1,540,3.55,4  1,740,3.52,4  0,640,3.35,3
    1,520,3.3,2  1,620,3.95,3  0,520,3.51,2  0,640,3.81,2  0,680,3.11,2  0,440,3.15,2  1,520,3.19,3  1,620,3.95,3
    1,520,3.9,3  0,380,3.34,3  0,560,3.24,4  1,600,3.64,3  1,680,3.46,2  0,500,2.81,3  1,640,3.95,2  0,540,3.33,3
    1,680,3.67,2  0,660,3.32,1  0,520,3.12,2  1,600,2.98,2  0,460,3.77,3  1,580,3.58,1  1,680,3,4  1,660,3.14,2
    0,660,3.94,2  0,360,3.27,3  0,660,3.45,4  0,520,3.1,4  1,440,3.39,2  0,600,3.31,4  1,800,3.22,1  1,660,3.7,4
    0,800,3.15,4  0,420,2.26,4  1,620,3.45,2  0,800,2.78,2  0,680,3.7,2  0,800,3.97,1  0,480,2.55,1  0,520,3.25,3
    0,560,3.16,1  0,460,3.07,2  0,540,3.5,2  0,720,3.4,3  0,640,3.3,2  1,660,3.6,3  1,400,3.15,2  1,680,3.98,2
    0,220,2.83,3  0,580,3.46,4  1,540,3.17,1  0,580,3.51,2  0,540,3.13,2  0,440,2.98,3  0,560,4,3  0,660,3.67,2
    0,660,3.77,3  1,520,3.65,4  0,540,3.46,4  1,300,2.84,2  1,340,3,2  1,780,3.63,4  1,480,3.71,4  0,540,3.28,1
    0,460,3.14,3  0,460,3.58,2  0,500,3.01,4  0,420,2.69,2  0,520,2.7,3  0,680,3.9,1  0,680,3.31,2  1,560,3.48,2
    0,580,3.34,2  0,500,2.93,4  0,740,4,3  0,660,3.59,3  0,420,2.96,1  0,560,3.43,3  1,460,3.64,3  1,620,3.71,1
    0,520,3.15,3  0,620,3.09,4  0,540,3.2,1  1,660,3.47,3  0,500,3.23,4  1,560,2.65,3  0,500,3.95,4  0,580,3.06,2
    0,520,3.35,3  0,500,3.03,3  0,600,3.35,2  0,580,3.8,2  0,400,3.36,2  0,620,2.85,2  1,780,4,2  0,620,3.43,3
    1,580,3.12,3  0,700,3.52,2  1,540,3.78,2  1,760,2.81,1  0,700,3.27,2  0,720,3.31,1  1,560,3.69,3  0,720,3.94,3
    1,520,4,1  1,540,3.49,1  0,680,3.14,2  0,460,3.44,2  1,560,3.36,1  0,480,2.78,3  0,460,2.93,3  0,620,3.63,3
    0,580,4,1  0,800,3.89,2  1,540,3.77,2  1,680,3.76,3  1,680,2.42,1  1,620,3.37,1  0,560,3.78,2  0,560,3.49,4
    0,620,3.63,2  1,800,4,2  0,640,3.12,3  0,540,2.7,2  0,700,3.65,2  1,540,3.49,2  0,540,3.51,2  0,660,4,1
    1,480,2.62,2  0,420,3.02,1  1,740,3.86,2  0,580,3.36,2  0,640,3.17,2  0,640,3.51,2  1,800,3.05,2  1,660,3.88,2
    1,600,3.38,3  1,620,3.75,2  1,460,3.99,3  0,620,4,2  0,560,3.04,3  0,460,2.63,2  0,700,3.65,2  0,600,3.89,3
"""


def grad_school(device: str) -> Table:
    rows = np.array([[float(v) for v in item.split(",")] for item in GRAD_SCHOOL.split()])
    rank = rows[:, 3]
    cols = {"admit": rows[:, 0].astype(np.int32), "gre": rows[:, 1].astype(np.int32), "gpa": rows[:, 2]}
    for r in (2, 3, 4):  # (rank = r)::INT::FLOAT8
        cols[f"rank{r}"] = (rank == r).astype(np.float64)
    return Table.from_arrays(cols, device=device)


def test_install_check_grad_school(device):
    table = grad_school(device)
    independent = "ARRAY[1, gre, gpa, rank2, rank3, rank4]"
    m = logregr_train(table, "admit", independent)
    coef = [-3.989979, 0.002264, 0.804038, -0.675443, -1.340204, -1.551464]
    assert relative_error(m.coefficients_, coef) < 1e-5
    assert relative_error(m.log_likelihood_, -229.2587) < 1e-5
    assert relative_error(m.std_err_, [1.139951, 0.001094, 0.331819, 0.316490, 0.345306, 0.417832]) < 1e-5
    assert relative_error(m.z_stats_, [-3.500, 2.070, 2.423, -2.134, -3.881, -3.713]) < 1e-3
    assert relative_error(m.p_values_, [0.000465, 0.038465, 0.015388, 0.032829, 0.000104, 0.000205]) < 1e-3
    odds = [0.0185001, 1.0022670, 2.2345448, 0.5089310, 0.2617923, 0.2119375]
    assert relative_error(m.odds_ratios_, odds) < 1e-5
    assert relative_error(m.condition_no_, 6379.028) < 1e-2
    # the install check then runs logregr_predict / logregr_predict_prob over the table (no assertion there)
    prob = _host(logregr_predict_prob(m.coefficients_, table, independent))
    assert prob.shape == (400,) and ((prob > 0) & (prob < 1)).all()
    np.testing.assert_array_equal(_host(logregr_predict(m.coefficients_, table, independent)), prob > 0.5)
