terraform {
  # No provider: the module only validates the settings and renders them as
  # the environment both node-fencer modules give the binary.
  required_version = ">= 1.5.0"
}
