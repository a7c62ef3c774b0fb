"""cProfile for the router process that ``benchmarks/proxy_cpu.py --profile OUT`` starts
(on ``PYTHONPATH`` for that process only): SIGUSR1 starts profiling the main thread (the
event loop), SIGUSR2 stops and writes the stats to ``$BENCH_PROFILE_OUT``, so only
the measured window is in the profile, not start-up."""

import cProfile
import os
import signal

_out = os.environ.get("BENCH_PROFILE_OUT")
_prof = cProfile.Profile()


def _start(*_: object) -> None:
    _prof.enable()


def _stop(*_: object) -> None:
    _prof.disable()
    if _out:
        _prof.dump_stats(_out)


if _out:
    signal.signal(signal.SIGUSR1, _start)
    signal.signal(signal.SIGUSR2, _stop)
