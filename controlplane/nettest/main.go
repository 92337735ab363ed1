// A tiny network probe for the real nodes' smoke test (tests/controlplane/test_real_nodes.py),
// static so that an image of this one file runs (controlplane/kube_images.py).
//
//	nettest serve PORT          answer each TCP connection with "hello from HOSTNAME\n"
//	nettest probe TARGET...     dial each target until all answered (or 120 s): HOST:PORT over
//	                            TCP, or "api" for GET /version through the kubernetes Service
//	                            with the pod's in-cluster credentials; exit 0 once all did
//
// probe prints "ok TARGET: ANSWER" once per target, then "all ok", or "FAIL TARGET: ERROR" for
// those that never answered: the test reads this from the pod's log through the API.
package main

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

const saDir = "/var/run/secrets/kubernetes.io/serviceaccount"

func serve(port string) error {
	ln, err := net.Listen("tcp", ":"+port)
	if err != nil {
		return err
	}
	host, _ := os.Hostname()
	fmt.Printf("listening on :%s as %s\n", port, host)
	for {
		conn, err := ln.Accept()
		if err != nil {
			return err
		}
		fmt.Printf("connection from %s\n", conn.RemoteAddr())
		fmt.Fprintf(conn, "hello from %s\n", host)
		conn.Close()
	}
}

func dial(target string) (string, error) {
	conn, err := net.DialTimeout("tcp", target, 2*time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(conn).ReadString('\n')
	return strings.TrimSpace(line), err
}

// api reads /version as client-go's in-cluster config would: the Service's address from the
// environment, the service-account token and the cluster CA from the projected volume.
func api() (string, error) {
	token, err := os.ReadFile(saDir + "/token")
	if err != nil {
		return "", err
	}
	ca, err := os.ReadFile(saDir + "/ca.crt")
	if err != nil {
		return "", err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	client := &http.Client{
		Timeout:   3 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
	}
	host := net.JoinHostPort(os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT"))
	req, err := http.NewRequest("GET", "https://"+host+"/version", nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", resp.Status, body)
	}
	return fmt.Sprintf("%s %s", resp.Status, strings.Join(strings.Fields(string(body)), " ")), nil
}

func probe(targets []string) int {
	errs := map[string]error{}
	for _, t := range targets {
		errs[t] = fmt.Errorf("not tried")
	}
	for deadline := time.Now().Add(120 * time.Second); len(errs) > 0 && time.Now().Before(deadline); {
		for t := range errs {
			var answer string
			var err error
			if t == "api" {
				answer, err = api()
			} else {
				answer, err = dial(t)
			}
			if err == nil {
				fmt.Printf("ok %s: %s\n", t, answer)
				delete(errs, t)
			} else {
				errs[t] = err
			}
		}
		if len(errs) > 0 {
			time.Sleep(500 * time.Millisecond) // a Service's rules or DNS records may lag the pod
		}
	}
	for t, err := range errs {
		fmt.Printf("FAIL %s: %v\n", t, err)
	}
	if len(errs) > 0 {
		return 1
	}
	fmt.Println("all ok")
	return 0
}

func main() {
	// PID 1 of its container: without a handler the kernel drops SIGTERM, and a pod's deletion
	// would wait out its whole grace period
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() { <-signals; os.Exit(0) }()
	if len(os.Args) >= 3 && os.Args[1] == "serve" {
		fmt.Fprintln(os.Stderr, serve(os.Args[2]))
		os.Exit(1)
	}
	if len(os.Args) >= 3 && os.Args[1] == "probe" {
		os.Exit(probe(os.Args[2:]))
	}
	fmt.Fprintln(os.Stderr, "usage: nettest serve PORT | nettest probe TARGET...")
	os.Exit(2)
}
