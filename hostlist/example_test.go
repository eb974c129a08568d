package hostlist_test

import (
	"fmt"

	"github.com/gangrun/gangrun/hostlist"
)

func ExampleExpand() {
	hosts, err := hostlist.Expand("node[001-003,010],gpu[1-2]-ib")
	fmt.Println(hosts, err)
	_, err = hostlist.Expand("n[10-1]")
	fmt.Println(err)
	// Output:
	// [node001 node002 node003 node010 gpu1-ib gpu2-ib] <nil>
	// hostlist: reversed range (10 is greater than 1) "10-1" at column 3 of "n[10-1]"
}

func ExampleCompress() {
	fmt.Println(hostlist.Compress([]string{"n1", "n2", "n3", "n7"}))
	fmt.Println(hostlist.Compress([]string{"n3", "n2", "n1"}))
	fmt.Println(hostlist.Compress([]string{"a1", "a2", "b1", "a3"}))
	fmt.Println(hostlist.Compress([]string{"n08", "n09", "n10", "n1"}))
	fmt.Println(hostlist.CompressSorted([]string{"n3", "n2", "n1"}))
	// Output:
	// n[1-3,7]
	// n[3,2,1]
	// a[1-2],b1,a3
	// n[08-10,1]
	// n[1-3]
}

func ExampleCount() {
	n, err := hostlist.Count("rack[01-40]-node[001-256]")
	fmt.Println(n, err)
	// Output:
	// 10240 <nil>
}
