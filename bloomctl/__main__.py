from bloomctl.cli import main

if __name__ == "__main__":  # pragma: no cover - exercised by a subprocess test
    main()
