package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tether-mcp/tether/internal/mcpbackend"
)

// backendsCommand runs MCP backends in this process, so that the proxy under
// test and the load generator never share a process with them. It prints
// "backend NAME ADDR" per backend, then "ready", and obeys commands on
// stdin, one per line:
//
//	kill NAME GRACE    stop NAME as a terminating pod does (GRACE: a duration)
//	restart NAME       start NAME again on its address, with no sessions
//	stats              one "stats NAME INITIALIZES CALLS LIVE_SESSIONS" line per backend, then "end"
//
// It exits when stdin closes or on SIGTERM; on SIGTERM its backends stop as
// Kill stops them, with -term-grace for the requests in flight (a pod's
// process ending gracefully).
func backendsCommand(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("tetherbench backends", flag.ContinueOnError)
	names := fs.String("names", "b0,b1,b2", "comma-separated backend names")
	listen := fs.String("listen", "127.0.0.1:0", "comma-separated listen addresses, one per name (or one for all)")
	namedIDs := fs.Bool("named-ids", false, "session ids start with the backend's name and a dot (what nginx OSS needs to route sessions; see docs/design.md#benchmark-anchors); "+
		"these backends are a go-sdk server with the same tools as internal/mcpbackend, and cannot be killed")
	termGrace := fs.Duration("term-grace", 0, "on SIGTERM, how long requests in flight may run on before every connection is cut (http.Server.Shutdown); 0 cuts them at once")
	if err := fs.Parse(args); err != nil {
		return err
	}
	nameList := strings.Split(*names, ",")
	addrs := strings.Split(*listen, ",")
	if len(addrs) != 1 && len(addrs) != len(nameList) {
		return fmt.Errorf("-listen: %d addresses for %d names", len(addrs), len(nameList))
	}
	type handle struct {
		mb    *mcpbackend.Backend
		named *namedBackend
	}
	bs := map[string]handle{}
	for i, name := range nameList {
		addr := addrs[0]
		if len(addrs) > 1 {
			addr = addrs[i]
		}
		if *namedIDs {
			nb, err := startNamed(name, addr)
			if err != nil {
				return err
			}
			bs[name] = handle{named: nb}
			fmt.Printf("backend %s %s\n", name, nb.addr)
			continue
		}
		b, err := mcpbackend.Start(name, addr)
		if err != nil {
			return err
		}
		defer b.Close()
		bs[name] = handle{mb: b}
		fmt.Printf("backend %s %s\n", name, b.Addr)
	}
	fmt.Println("ready")

	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	for {
		var line string
		select {
		case <-ctx.Done():
			var wg sync.WaitGroup
			for _, h := range bs {
				if h.mb != nil {
					wg.Go(func() { h.mb.Kill(*termGrace) })
				}
			}
			wg.Wait()
			return nil
		case l, ok := <-lines:
			if !ok {
				return nil
			}
			line = l
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		switch {
		case f[0] == "stats":
			for _, name := range nameList {
				h := bs[name]
				if h.mb != nil {
					fmt.Printf("stats %s %d %d %d\n", name, h.mb.Initializes.Load(), h.mb.Calls.Load(), h.mb.LiveSessions())
				} else {
					fmt.Printf("stats %s %d %d %d\n", name, h.named.initializes.Load(), h.named.calls.Load(), 0)
				}
			}
			fmt.Println("end")
		case f[0] == "kill" && len(f) == 3 && bs[f[1]].mb != nil:
			grace, err := time.ParseDuration(f[2])
			if err != nil {
				fmt.Println("error", err)
				continue
			}
			bs[f[1]].mb.Kill(grace)
			fmt.Println("ok")
		case f[0] == "restart" && len(f) == 2 && bs[f[1]].mb != nil:
			if err := bs[f[1]].mb.Restart(0); err != nil {
				fmt.Println("error", err)
				continue
			}
			fmt.Println("ok")
		default:
			fmt.Println("error unknown command", strconv.Quote(line))
		}
	}
}

// namedBackend is a go-sdk MCP server with internal/mcpbackend's tools whose
// session ids are "<name>.<random hex>".
type namedBackend struct {
	name               string
	addr               string
	initializes, calls atomic.Int64
}

func startNamed(name, addr string) (*namedBackend, error) {
	nb := &namedBackend{name: name}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("backend %s: %w", name, err)
	}
	nb.addr = ln.Addr().String()
	server := mcp.NewServer(&mcp.Implementation{Name: name, Version: "1.0.0"}, &mcp.ServerOptions{
		GetSessionID: func() string {
			nb.initializes.Add(1)
			var b [16]byte
			rand.Read(b[:])
			return name + "." + hex.EncodeToString(b[:])
		},
	})
	mcp.AddTool(server, &mcp.Tool{Name: "whoami", Description: "name the backend that serves this session"},
		func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, mcpbackend.WhoamiOutput, error) {
			nb.calls.Add(1)
			return nil, mcpbackend.WhoamiOutput{Backend: name}, nil
		})
	mcp.AddTool(server, &mcp.Tool{Name: "echo", Description: "echo the text back"},
		func(ctx context.Context, req *mcp.CallToolRequest, in mcpbackend.EchoInput) (*mcp.CallToolResult, mcpbackend.EchoOutput, error) {
			nb.calls.Add(1)
			return nil, mcpbackend.EchoOutput{Text: in.Text, Backend: name}, nil
		})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	return nb, nil
}
