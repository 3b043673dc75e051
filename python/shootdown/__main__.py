"""``python -m shootdown`` — same as the ``shootdown`` command."""

from .cli import main

if __name__ == "__main__":
    main()
