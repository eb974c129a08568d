module github.com/gangrun/gangrun

go 1.26.7

require github.com/spf13/pflag v1.1.0
