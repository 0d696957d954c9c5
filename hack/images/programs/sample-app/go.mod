module ambient-operator/hack/images/programs/sample-app

go 1.26.0
