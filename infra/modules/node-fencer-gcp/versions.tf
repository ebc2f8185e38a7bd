terraform {
  # Uses preconditions and startswith() (1.3+); OpenTofu 1.6+ works too.
  required_version = ">= 1.5.0"

  required_providers {
    google = {
      source = "hashicorp/google"
      # 6.0 added deletion_protection to google_cloud_run_v2_service (on by
      # default); 6.1 is the oldest release the tests validate against, and
      # 8.x the newest (tests/stack/setup.sh): a major release beyond it may
      # drop arguments, so it stays out until it has been validated.
      version = ">= 6.1, < 9.0"
    }
    random = {
      source  = "hashicorp/random"
      version = ">= 3.5"
    }
  }
}
