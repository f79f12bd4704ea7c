// promql-check: reads PromQL expressions, one JSON string per line on stdin, and prints one line per
// expression: "ok" or the parser's error (github.com/prometheus/prometheus/promql/parser).
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/prometheus/prometheus/promql/parser"
)

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<24)
	for in.Scan() {
		var expr string
		if err := json.Unmarshal(in.Bytes(), &expr); err != nil {
			fmt.Println("bad input:", err)
			continue
		}
		if _, err := parser.ParseExpr(expr); err != nil {
			fmt.Println(strings.ReplaceAll(err.Error(), "\n", " "))
		} else {
			fmt.Println("ok")
		}
	}
}
