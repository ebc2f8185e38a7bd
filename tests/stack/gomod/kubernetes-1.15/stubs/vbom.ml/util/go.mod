// An empty stand-in for vbom.ml/util, which the Go proxy no longer serves: see
// ../../../go.mod. No package of it is built.
module vbom.ml/util
