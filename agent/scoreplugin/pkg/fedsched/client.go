package fedsched

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// maxReconnectDelay caps gRPC's reconnection backoff (its default grows to 120 s): after an
// agent restart the plugin answers from the fallback until it is connected again, which
// should take seconds, not minutes.
const maxReconnectDelay = 5 * time.Second

// dial opens the (lazy, non-blocking) client connection to the agent and starts connecting, so
// the first pod does not pay the TLS handshake inside its deadline.
func dial(a *Args) (*grpc.ClientConn, error) {
	var creds credentials.TransportCredentials
	if a.Insecure {
		creds = insecure.NewCredentials()
	} else {
		cfg, err := clientTLSConfig(a.TLS)
		if err != nil {
			return nil, err
		}
		creds = credentials.NewTLS(cfg)
	}
	bo := backoff.DefaultConfig
	bo.MaxDelay = maxReconnectDelay
	conn, err := grpc.NewClient(a.Address,
		grpc.WithTransportCredentials(creds),
		grpc.WithUserAgent("fedsched-scoreplugin"),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: bo, MinConnectTimeout: time.Second}),
		grpc.WithIdleTimeout(0), // stay connected between pods
	)
	if err != nil {
		return nil, fmt.Errorf("gRPC client for %q: %w", a.Address, err)
	}
	conn.Connect()
	return conn, nil
}

// keepConnected connects again at once whenever the connection goes idle (the agent sends GOAWAY
// to a connection without an RPC for its --grpc-idle-timeout), so the next pod finds it ready
// instead of paying the handshake inside its deadline. It returns when ctx ends or the connection
// is closed.
func keepConnected(ctx context.Context, conn *grpc.ClientConn) {
	for {
		s := conn.GetState()
		switch s {
		case connectivity.Shutdown:
			return
		case connectivity.Idle:
			conn.Connect()
		}
		if !conn.WaitForStateChange(ctx, s) {
			return
		}
	}
}

// clientTLSConfig is the mutual TLS configuration: the agent's certificate must chain to the
// CA file and carry ServerName; the client certificate is read from its files at every
// handshake whose files changed since the last one (a renewed certificate needs no restart;
// the CA is read once).
func clientTLSConfig(t *TLSArgs) (*tls.Config, error) {
	caPEM, err := os.ReadFile(t.CAFile)
	if err != nil {
		return nil, fmt.Errorf("tls.caFile: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("tls.caFile %s: no PEM certificate in it", t.CAFile)
	}
	kp := &keyPair{certFile: t.CertFile, keyFile: t.KeyFile}
	if _, err := kp.get(); err != nil { // fail at start-up, not at the first pod
		return nil, err
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		RootCAs:    pool,
		ServerName: t.ServerName,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return kp.get()
		},
	}, nil
}

// keyPair is the client certificate, reloaded when either file's modification time changes.
type keyPair struct {
	certFile, keyFile string

	mu              sync.Mutex
	cert            *tls.Certificate
	certMod, keyMod time.Time
}

func (k *keyPair) get() (*tls.Certificate, error) {
	cs, err := os.Stat(k.certFile)
	if err != nil {
		return k.cached(fmt.Errorf("tls.certFile: %w", err))
	}
	ks, err := os.Stat(k.keyFile)
	if err != nil {
		return k.cached(fmt.Errorf("tls.keyFile: %w", err))
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.cert != nil && cs.ModTime().Equal(k.certMod) && ks.ModTime().Equal(k.keyMod) {
		return k.cert, nil
	}
	c, err := tls.LoadX509KeyPair(k.certFile, k.keyFile)
	if err != nil {
		if k.cert != nil { // a half-written renewal: keep the old pair until both files agree
			return k.cert, nil
		}
		return nil, fmt.Errorf("tls.certFile/keyFile (%s, %s): %w", k.certFile, k.keyFile, err)
	}
	k.cert, k.certMod, k.keyMod = &c, cs.ModTime(), ks.ModTime()
	return k.cert, nil
}

func (k *keyPair) cached(err error) (*tls.Certificate, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.cert != nil {
		return k.cert, nil
	}
	return nil, err
}
