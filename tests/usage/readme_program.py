#!/usr/bin/env python3
"""Turns the C++ blocks of README.md into one program, so that the test suite compiles and runs
what a user copies: the blocks run in order, as one main(), with their #include lines hoisted to
the top. Usage: readme_program.py README.md OUT.cpp"""
import sys


def main() -> int:
    readme, out = sys.argv[1], sys.argv[2]
    includes, body, block, inside = [], [], 0, False
    for number, line in enumerate(open(readme, encoding="utf-8"), start=1):
        stripped = line.rstrip("\n")
        if not inside and stripped.strip() == "```cpp":
            inside, block = True, block + 1
            body.append(f"  // README.md block {block}, line {number + 1}\n")
            continue
        if inside and stripped.strip() == "```":
            inside = False
            continue
        if inside:
            if stripped.startswith("#include"):
                includes.append(stripped + "\n")
            else:
                body.append(f"#line {number} \"README.md\"\n  {stripped}\n")
    if inside:
        print(f"{readme}: a ```cpp block is not closed", file=sys.stderr)
        return 1
    if block == 0:
        print(f"{readme}: no ```cpp block found", file=sys.stderr)
        return 1
    # Blocks continue each other (the second uses the first's data): one scope, not one per block.
    with open(out, "w", encoding="utf-8") as f:
        f.write("// Generated from README.md by tests/usage/readme_program.py: do not edit.\n")
        f.writelines(dict.fromkeys(includes))
        f.write("#include <exception>\n#include <iostream>\n\nint main() try {\n")
        f.writelines(body)
        f.write("  return 0;\n} catch (const std::exception& e) {\n"
                "  std::cerr << \"README tour: \" << e.what() << \"\\n\";\n  return 1;\n}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
