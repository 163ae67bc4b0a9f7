"""Runs one compatibility script (`run.py SCRIPT [ARGS...]`) as `__main__`, then leaves without
finalising the interpreter: the SDK's client threads sometimes abort it there (SIGABRT with
nothing on stderr, after the script's last line was printed; seen in loaded suite runs). The
exit status is the script's own: 0 when it ran to its end, its `SystemExit` code, or 1 with the
traceback when it raised."""

import os
import runpy
import sys
import traceback


def main():
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit:
        if exit.code is None or isinstance(exit.code, int):
            code = exit.code or 0
        else:
            print(exit.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


main()
