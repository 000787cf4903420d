from pytest_hemra.cli import main

raise SystemExit(main())
