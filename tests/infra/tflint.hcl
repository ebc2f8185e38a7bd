# tflint's bundled terraform ruleset, every rule of it: infra/ is checked with
# `tflint --recursive --config tests/infra/tflint.hcl` (tests/infra/test_tflint.py).
plugin "terraform" {
  enabled = true
  preset  = "all"
}
