"""``python -m mmdet3d_scaling.patches [--markdown]``: list the declared patches."""
import argparse

import mmdet3d_scaling  # noqa: F401  (declares the patches, applies the default sets)
from mmdet3d_scaling.patches import patching


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--markdown', action='store_true',
                        help='print the table of docs/patches.md instead of the text table '
                             'with what is applied in this process')
    args = parser.parse_args()
    print(patching.markdown_table() if args.markdown else patching.table())


if __name__ == '__main__':
    main()
