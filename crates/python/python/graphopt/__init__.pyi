from ._graphopt import GraphoptError as GraphoptError
from ._graphopt import Session as Session
from ._graphopt import __version__ as __version__
from ._graphopt import cli_main as cli_main
from ._graphopt import load as load
from ._graphopt import passes as passes
