// Command sample-app is the HTTP server and client that the real-node tests and
// the demo run as workloads: `sample-app serve` answers every request with the
// pod's name and the peer address it saw; `sample-app get URL` makes one
// request per connection (so each is a new TCP connection through ztunnel) and
// prints the answer (or with -timings, each request's time from dial to the
// whole answer read, in microseconds), exiting non-zero on any failure.
package main

import (
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	addr := fs.String("addr", ":8080", "address to listen on")
	_ = fs.Parse(args)
	name, _ := os.Hostname()
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "server=%s peer=%s\n", name, r.RemoteAddr)
	})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	server := &http.Server{Addr: *addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	return server.ListenAndServe()
}

func get(args []string) error {
	fs := flag.NewFlagSet("get", flag.ExitOnError)
	count := fs.Int("count", 1, "requests to make, each on a new connection")
	timeout := fs.Duration("timeout", 10*time.Second, "timeout of each request")
	timings := fs.Bool("timings", false, "print each request's time in microseconds, not the answer")
	_ = fs.Parse(args)
	if fs.NArg() != 1 {
		return fmt.Errorf("usage: sample-app get [-count N] [-timings] URL")
	}
	client := &http.Client{
		Timeout:   *timeout,
		Transport: &http.Transport{DisableKeepAlives: true},
	}
	for i := 0; i < *count; i++ {
		began := time.Now()
		resp, err := client.Get(fs.Arg(0))
		if err != nil {
			return err
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s", fs.Arg(0), resp.Status)
		}
		if *timings {
			fmt.Println(time.Since(began).Microseconds())
		} else {
			fmt.Print(string(body))
		}
	}
	return nil
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: sample-app serve [-addr :8080] | get [-count N] [-timings] URL")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "get":
		err = get(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sample-app:", err)
		os.Exit(1)
	}
}
