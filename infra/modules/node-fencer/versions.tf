terraform {
  # Uses preconditions and endswith() (1.3+); OpenTofu 1.6+ works too.
  required_version = ">= 1.5.0"

  required_providers {
    aws = {
      source = "hashicorp/aws"
      # 6.29 is the first release whose aws_lambda_function_url grants both
      # lambda:InvokeFunctionUrl and lambda:InvokeFunction (InvokedViaFunctionUrl)
      # for authorization_type = "NONE": function URLs created since October 2025
      # answer 403 without the second one.
      version = ">= 6.29"
    }
    random = {
      source  = "hashicorp/random"
      version = ">= 3.5"
    }
  }
}
