// Command terraform-provider-schema-only serves one provider's schema, read
// from schema.json beside it, over the Terraform plugin protocol (v6), so that
// `tofu validate`, `plan` and `test` check a configuration against the real
// provider's arguments and types without the provider or its API. It is
// built and installed as hashicorp/aws, hashicorp/kubernetes and
// hashicorp/random by tests/stack/setup.sh; see infra/docs/tests.md for what it
// cannot check.
package main

import (
	"fmt"
	"os"

	"github.com/hashicorp/terraform-plugin-go/tfprotov6"
	"github.com/hashicorp/terraform-plugin-go/tfprotov6/tf6server"
)

func main() {
	f, err := loadSchema()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	s, err := newServer(f)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := tf6server.Serve("registry.opentofu.org/hashicorp/"+f.Provider, func() tfprotov6.ProviderServer { return s }); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
