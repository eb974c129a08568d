module github.com/gangrun/gangrun

go 1.26.7

require (
	github.com/spf13/pflag v1.1.0
	go.uber.org/zap v1.28.0
	golang.org/x/sys v0.50.0
)

require go.uber.org/multierr v1.10.0 // indirect
