"""What the peer scripts share: the workload selection `benchmarks/run` passes and bounded waits.

Each peer script names its workloads as `benchmarks/run` does ("<workload>/<mode>/<workers>" for
the data group, "<workload>/<batch>/<threads>" for the keras group) and takes

    --list            print the names, one a line, and exit (before PyTorch is imported)
    --only REGEX      measure only the workloads whose names REGEX matches (re.search)
    --timeout S       seconds one measurement may take before it counts as hung

A measurement that fails ends the script with one line on stderr that names the workload and
exit status 1, never a traceback or a hang.
"""
import argparse
import os
import re
import sys


def select(names, description, add_arguments=None):
    """The names that --only selects (all by default) and the parsed arguments; add_arguments,
    if given, adds a script's own options to the parser. names may be a function of the parsed
    arguments (a script whose names depend on its options)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--list", action="store_true",
                        help="print the workload names, one a line, and exit")
    parser.add_argument("--only", default="", metavar="REGEX",
                        help="measure only the workloads whose names match REGEX (default: all)")
    parser.add_argument("--timeout", type=float, default=300.0, metavar="S",
                        help="seconds one measurement may take (default 300)")
    if add_arguments:
        add_arguments(parser)
    args = parser.parse_args()
    if callable(names):
        names = names(args)
    if args.list:
        print("\n".join(names))
        sys.exit(0)
    try:
        pattern = re.compile(args.only)
    except re.error as error:
        fail("--only", f"'{args.only}' is not a regular expression: {error}")
    return [name for name in names if pattern.search(name)], args


def fail(workload, message):
    """Ends the script with one line naming the script and the workload."""
    script = os.path.basename(sys.argv[0])
    print(f"peers/{script}: {workload}: {message}", file=sys.stderr, flush=True)
    sys.exit(1)
