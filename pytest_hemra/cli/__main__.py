from pytest_hemra.cli.main import main

raise SystemExit(main())
