"""`python -m abp_jobs_client`: the abp-jobs command line."""

from abp_jobs_client.cli import main

raise SystemExit(main())
