"""Quickstart trial: a small neural network on scikit-learn's bundled digits data set.

Each epoch reports the validation accuracy as an intermediate result; the last one is the
final result. Written against NNI's trial API, so it runs unchanged under NNI; without NNI
installed it uses nni-agent's stdlib copy of the same functions.
"""
import warnings

try:
    import nni
except ImportError:
    import nni_agent as nni

from sklearn.datasets import load_digits
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier
from sklearn.preprocessing import StandardScaler

EPOCHS = 20

params = {"hidden_size": 64, "learning_rate_init": 0.001, "alpha": 0.0001, "batch_size": 32}
params.update(nni.get_next_parameter() or {})  # outside an experiment: the defaults above

X, y = load_digits(return_X_y=True)
X_train, X_val, y_train, y_val = train_test_split(X, y, test_size=0.25, random_state=0, stratify=y)
scaler = StandardScaler().fit(X_train)
X_train, X_val = scaler.transform(X_train), scaler.transform(X_val)

model = MLPClassifier(
    hidden_layer_sizes=(int(params["hidden_size"]),),
    learning_rate_init=params["learning_rate_init"],
    alpha=params["alpha"],
    batch_size=int(params["batch_size"]),
    random_state=0,
)
warnings.filterwarnings("ignore", category=ConvergenceWarning)
accuracy = 0.0
for epoch in range(EPOCHS):
    model.partial_fit(X_train, y_train, classes=list(range(10)))
    accuracy = model.score(X_val, y_val)
    nni.report_intermediate_result(accuracy)
    print(f"epoch {epoch + 1}: validation accuracy {accuracy:.4f}", flush=True)
nni.report_final_result(accuracy)
