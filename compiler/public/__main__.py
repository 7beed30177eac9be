"""``python -m lumc``: the ``lumc`` command line (:func:`lumc.compiler.tools.cli.main`), with the
console script's handling of SIGINT and SIGTERM while the CLI imports."""
from lumc.compiler.tools.cli_signals import handle_signals_while_starting

handle_signals_while_starting(run_as_main=True)

from lumc.compiler.tools.cli import main  # noqa: E402

main()
