package fedsched

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"fedsched.dev/scoreplugin/pkg/decisionpb"
)

// fakeAgent is an in-process fedsched.decision.v1.DecisionService.
type fakeAgent struct {
	decisionpb.UnimplementedDecisionServiceServer

	delay   time.Duration
	err     error                                        // returned by both scoring RPCs when set
	scores  func(names []string) []*decisionpb.NodeScore // ScoreNodes' answer
	weights map[string]float64                           // GetSchedulingWeights' answer
	refused func(names []string) []*decisionpb.NodeRefusal
	// FilterNodes' answer (nil: UNIMPLEMENTED, as an agent older than the RPC answers)

	mu          sync.Mutex
	calls       int
	filterCalls int
	pods        []map[string]any // the pod_json of each scoring request, decoded
	names       [][]string
}

func (f *fakeAgent) record(podJSON []byte, names []string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	var pod map[string]any
	if err := json.Unmarshal(podJSON, &pod); err != nil {
		return status.Errorf(codes.InvalidArgument, "pod_json: %v", err)
	}
	f.pods = append(f.pods, pod)
	f.names = append(f.names, append([]string(nil), names...))
	return nil
}

// waitCalls waits until count (read under the agent's lock) reaches n or the timeout passes, and
// returns it: the agent's handlers run on their own goroutines, after the plugin may have given up.
func (f *fakeAgent) waitCalls(count func() int, n int, timeout time.Duration) int {
	stop := time.Now().Add(timeout)
	for {
		f.mu.Lock()
		got := count()
		f.mu.Unlock()
		if got >= n || time.Now().After(stop) {
			return got
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (f *fakeAgent) wait(ctx context.Context) error {
	f.mu.Lock()
	delay := f.delay
	f.mu.Unlock()
	select {
	case <-time.After(delay):
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}

func (f *fakeAgent) ScoreNodes(ctx context.Context, req *decisionpb.ScoreNodesRequest) (*decisionpb.ScoreNodesResponse, error) {
	if err := f.record(req.GetPodJson(), req.GetNodeNames()); err != nil {
		return nil, err
	}
	if err := f.wait(ctx); err != nil {
		return nil, err
	}
	if f.err != nil {
		return nil, f.err
	}
	return &decisionpb.ScoreNodesResponse{Scores: f.scores(req.GetNodeNames()), ModelVersion: "test", Source: "policy"}, nil
}

func (f *fakeAgent) GetSchedulingWeights(ctx context.Context, req *decisionpb.GetSchedulingWeightsRequest) (*decisionpb.GetSchedulingWeightsResponse, error) {
	if err := f.record(req.GetPodJson(), req.GetNodeNames()); err != nil {
		return nil, err
	}
	if err := f.wait(ctx); err != nil {
		return nil, err
	}
	if f.err != nil {
		return nil, f.err
	}
	return &decisionpb.GetSchedulingWeightsResponse{Weights: f.weights, ModelVersion: "test"}, nil
}

func (f *fakeAgent) FilterNodes(ctx context.Context, req *decisionpb.FilterNodesRequest) (*decisionpb.FilterNodesResponse, error) {
	f.mu.Lock()
	f.filterCalls++
	f.mu.Unlock()
	var pod map[string]any
	if err := json.Unmarshal(req.GetPodJson(), &pod); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "pod_json: %v", err)
	}
	if err := f.wait(ctx); err != nil {
		return nil, err
	}
	if f.refused == nil {
		return f.UnimplementedDecisionServiceServer.FilterNodes(ctx, req)
	}
	return &decisionpb.FilterNodesResponse{Refused: f.refused(req.GetNodeNames())}, nil
}

// rankScores gives the i-th candidate 100 - 10*i.
func rankScores(names []string) []*decisionpb.NodeScore {
	out := make([]*decisionpb.NodeScore, len(names))
	for i, n := range names {
		out[i] = &decisionpb.NodeScore{Node: n, Score: int64(100 - 10*i)}
	}
	return out
}

// serve starts the fake agent on a loopback port; opts e.g. TLS credentials.
func serve(t *testing.T, agent *fakeAgent, opts ...grpc.ServerOption) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	decisionpb.RegisterDecisionServiceServer(srv, agent)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

// deadAddress is a loopback port nothing listens on (connections are refused).
func deadAddress(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	return addr
}

// silentAddress accepts TCP connections and never answers (a hung agent or a black hole).
func silentAddress(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		lis.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return lis.Addr().String()
}

func newPlugin(t *testing.T, args *Args) *Plugin {
	t.Helper()
	a, err := DecodeArgs(args)
	if err != nil {
		t.Fatal(err)
	}
	pl, err := NewWithArgs(context.Background(), a)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pl.Close() })
	return pl
}

// cluster: three nodes; LeastAllocated for a 1000m/2048Mi pod: n1 75, n2 50 (half used), n3 87.
func cluster() []fwk.NodeInfo {
	return []fwk.NodeInfo{
		makeNode("n1", 4000, 8192, 0),
		makeNode("n2", 4000, 8192, 0, makePod("busy", 1000, 2048, 0, nil)),
		makeNode("n3", 8000, 16384, 0),
	}
}

// schedule runs PreScore, Score on every node and NormalizeScore, as the framework does.
func schedule(t *testing.T, pl *Plugin, pod *v1.Pod, nodes []fwk.NodeInfo) (map[string]int64, time.Duration) {
	t.Helper()
	ctx := context.Background()
	cs := framework.NewCycleState()
	start := time.Now()
	if st := pl.PreScore(ctx, cs, pod, nodes); !st.IsSuccess() {
		t.Fatalf("PreScore: %v", st)
	}
	elapsed := time.Since(start)
	list := make(fwk.NodeScoreList, len(nodes))
	for i, ni := range nodes {
		s, st := pl.Score(ctx, cs, pod, ni)
		if !st.IsSuccess() {
			t.Fatalf("Score(%s): %v", ni.Node().Name, st)
		}
		list[i] = fwk.NodeScore{Name: ni.Node().Name, Score: s}
	}
	if st := pl.ScoreExtensions().NormalizeScore(ctx, cs, pod, list); !st.IsSuccess() {
		t.Fatalf("NormalizeScore: %v", st)
	}
	out := map[string]int64{}
	for _, s := range list {
		out[s.Name] = s.Score
	}
	return out, elapsed
}

var leastAllocated = map[string]int64{"n1": 75, "n2": 50, "n3": 87}

func TestPlugin(t *testing.T) {
	policy := map[string]int64{"n1": 100, "n2": 90, "n3": 80}
	tests := []struct {
		name   string
		agent  *fakeAgent // nil: no agent at all (address refuses connections)
		silent bool       // an address that accepts and never answers
		args   Args       // Address and Insecure are filled in
		want   map[string]int64
		reason string // the fallback reason in the CycleState, "" when the agent answered
	}{{
		name:  "scores: the policy's scores",
		agent: &fakeAgent{scores: rankScores},
		want:  policy,
	}, {
		name:  "scores, MinMax",
		agent: &fakeAgent{scores: rankScores},
		args:  Args{Normalization: NormalizeMinMax},
		want:  map[string]int64{"n1": 100, "n2": 50, "n3": 0},
	}, {
		// n1: cpu (4000-1000)/4000 = .75; n2: (4000-2000)/4000 = .5; n3: (8000-1000)/8000 = .875
		name:  "weights: the weighted free shares",
		agent: &fakeAgent{weights: map[string]float64{"free_cpu": 1}},
		args:  Args{Mode: ModeWeights},
		want:  map[string]int64{"n1": 75, "n2": 50, "n3": 88},
	}, {
		name:  "weights: terms the plugin cannot compute are ignored, the rest rescaled",
		agent: &fakeAgent{weights: map[string]float64{"free_cpu": 0.5, "cool_cpu": 0.25, "hot_mem": 0.25}},
		args:  Args{Mode: ModeWeights},
		want:  map[string]int64{"n1": 75, "n2": 50, "n3": 88},
	}, {
		name:  "weights, MinMax",
		agent: &fakeAgent{weights: map[string]float64{"load_cpu": 0.5, "load_mem": 0.5}},
		args:  Args{Mode: ModeWeights, Normalization: NormalizeMinMax},
		// loads: n1 .25/.25 -> 25, n2 .5/.5 -> 50, n3 .125/.125 -> 13; stretched: 32, 100, 0
		want: map[string]int64{"n1": 32, "n2": 100, "n3": 0},
	}, {
		name:   "agent down: LeastAllocated",
		agent:  nil,
		want:   leastAllocated,
		reason: reasonUnavailable,
	}, {
		name:   "agent down: Neutral",
		agent:  nil,
		args:   Args{Fallback: FallbackNeutral},
		want:   map[string]int64{"n1": 0, "n2": 0, "n3": 0},
		reason: reasonUnavailable,
	}, {
		name:   "slower than the deadline",
		agent:  &fakeAgent{delay: 300 * time.Millisecond, scores: rankScores},
		args:   Args{Deadline: &metav1.Duration{Duration: 30 * time.Millisecond}},
		want:   leastAllocated,
		reason: reasonTimeout,
	}, {
		name:   "a silent agent: the deadline still holds",
		silent: true,
		args:   Args{Deadline: &metav1.Duration{Duration: 30 * time.Millisecond}},
		want:   leastAllocated,
		reason: reasonTimeout,
	}, {
		name:   "MinMax is not applied to the fallback",
		agent:  nil,
		args:   Args{Normalization: NormalizeMinMax},
		want:   leastAllocated,
		reason: reasonUnavailable,
	}, {
		name:   "weights without a weight policy: FAILED_PRECONDITION",
		agent:  &fakeAgent{err: status.Error(codes.FailedPrecondition, "node-scoring policy only")},
		args:   Args{Mode: ModeWeights},
		want:   leastAllocated,
		reason: reasonFailedPrecondition,
	}, {
		name:   "agent refuses the pod",
		agent:  &fakeAgent{err: status.Error(codes.InvalidArgument, "pod: bad")},
		want:   leastAllocated,
		reason: reasonInvalidArgument,
	}, {
		name:   "other gRPC errors",
		agent:  &fakeAgent{err: status.Error(codes.ResourceExhausted, "busy")},
		want:   leastAllocated,
		reason: reasonError,
	}, {
		name:   "a node missing from the answer",
		agent:  &fakeAgent{scores: func(n []string) []*decisionpb.NodeScore { return rankScores(n)[1:] }},
		want:   leastAllocated,
		reason: reasonBadResponse,
	}, {
		name: "a node scored twice",
		agent: &fakeAgent{scores: func(n []string) []*decisionpb.NodeScore {
			s := rankScores(n)
			s[1] = s[0]
			return s
		}},
		want:   leastAllocated,
		reason: reasonBadResponse,
	}, {
		name: "a score above 100",
		agent: &fakeAgent{scores: func(n []string) []*decisionpb.NodeScore {
			s := rankScores(n)
			s[0].Score = 1000
			return s
		}},
		want:   leastAllocated,
		reason: reasonBadResponse,
	}, {
		name:   "negative weights",
		agent:  &fakeAgent{weights: map[string]float64{"free_cpu": -1}},
		args:   Args{Mode: ModeWeights},
		want:   leastAllocated,
		reason: reasonBadResponse,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := tt.args
			args.Insecure = true
			if args.Deadline == nil {
				args.Deadline = &metav1.Duration{Duration: MaxDeadline} // answers in time on a loaded machine
			}
			switch {
			case tt.agent != nil:
				args.Address = serve(t, tt.agent)
			case tt.silent:
				args.Address = silentAddress(t)
			default:
				args.Address = deadAddress(t)
			}
			pl := newPlugin(t, &args)
			if tt.agent != nil {
				waitReady(t, pl) // a short deadline is then the agent's, not the connection's
			}
			pod := makePod("p", 1000, 2048, 0, nil)
			got, elapsed := schedule(t, pl, pod, cluster())
			for n, w := range tt.want {
				if got[n] != w {
					t.Errorf("scores %v, want %v", got, tt.want)
					break
				}
			}
			limit := pl.args.Deadline.Duration + 250*time.Millisecond // slack for a loaded CI machine
			if elapsed > limit {
				t.Errorf("PreScore took %s, more than the deadline %s (+ slack)", elapsed, pl.args.Deadline.Duration)
			}
			cs := framework.NewCycleState()
			_ = pl.PreScore(context.Background(), cs, pod, cluster())
			s, err := getState(cs)
			if err != nil {
				t.Fatal(err)
			}
			if s.reason != tt.reason {
				t.Errorf("fallback reason %q, want %q", s.reason, tt.reason)
			}
			if tt.agent != nil {
				calls := tt.agent.waitCalls(func() int { return tt.agent.calls }, 2, 5*time.Second)
				tt.agent.mu.Lock()
				defer tt.agent.mu.Unlock()
				switch {
				case tt.reason == reasonTimeout && (calls < 1 || calls > 2):
					// A call cancelled before its body left the client never reaches the handler,
					// so a loaded machine may deliver one of the two; never more (no retries).
					t.Fatalf("the agent got %d calls for 2 timed-out scheduling cycles, want 1 or 2", calls)
				case tt.reason != reasonTimeout && calls != 2:
					t.Fatalf("the agent got %d calls for 2 scheduling cycles, want 2 (one per pod)", calls)
				}
				names := tt.agent.names[0]
				if len(names) != 3 || names[0] != "n1" || names[1] != "n2" || names[2] != "n3" {
					t.Errorf("node names sent %v, want [n1 n2 n3]", names)
				}
				meta, _ := tt.agent.pods[0]["metadata"].(map[string]any)
				if meta["name"] != "p" || meta["namespace"] != "default" {
					t.Errorf("pod_json metadata %v, want name p in default", meta)
				}
			}
		})
	}
}

// waitReady waits until the plugin's connection to the agent is up.
func waitReady(t *testing.T, pl *Plugin) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for st := pl.conn.GetState(); st != connectivity.Ready; st = pl.conn.GetState() {
		if !pl.conn.WaitForStateChange(ctx, st) {
			t.Fatalf("no connection to the test agent (state %s)", st)
		}
	}
}

func TestPluginRecovers(t *testing.T) {
	agent := &fakeAgent{delay: time.Second, scores: rankScores}
	pl := newPlugin(t, &Args{Address: serve(t, agent), Insecure: true, Deadline: &metav1.Duration{Duration: 200 * time.Millisecond}})
	waitReady(t, pl)
	pod := makePod("p", 1000, 2048, 0, nil)
	if got, _ := schedule(t, pl, pod, cluster()); got["n3"] != leastAllocated["n3"] {
		t.Fatalf("slow agent: scores %v, want the fallback %v", got, leastAllocated)
	}
	agent.mu.Lock()
	agent.delay = 0
	agent.mu.Unlock()
	if got, _ := schedule(t, pl, pod, cluster()); got["n1"] != 100 || got["n3"] != 80 {
		t.Fatalf("agent back: scores %v, want the policy's", got)
	}
}

func TestScoreWithoutPreScore(t *testing.T) {
	pl := newPlugin(t, &Args{Address: deadAddress(t), Insecure: true})
	pod := makePod("p", 1000, 2048, 0, nil)
	for _, ni := range cluster() {
		s, st := pl.Score(context.Background(), framework.NewCycleState(), pod, ni)
		if !st.IsSuccess() || s != leastAllocated[ni.Node().Name] {
			t.Errorf("Score(%s) without PreScore = %d, %v; want %d", ni.Node().Name, s, st, leastAllocated[ni.Node().Name])
		}
	}
}

func TestPreScoreWithoutNodes(t *testing.T) {
	agent := &fakeAgent{scores: rankScores}
	pl := newPlugin(t, &Args{Address: serve(t, agent), Insecure: true})
	cs := framework.NewCycleState()
	if st := pl.PreScore(context.Background(), cs, makePod("p", 1, 1, 0, nil), nil); !st.IsSuccess() {
		t.Fatal(st)
	}
	if agent.calls != 0 {
		t.Errorf("the agent was called %d times for a pod without candidates", agent.calls)
	}
}

func TestSignPodRefuses(t *testing.T) {
	pl := newPlugin(t, &Args{Address: deadAddress(t), Insecure: true})
	if _, st := pl.SignPod(context.Background(), makePod("p", 1, 1, 0, nil)); st.Code() != fwk.Unschedulable {
		t.Errorf("SignPod status %v, want Unschedulable (no batching)", st)
	}
}

func TestFactoryFromKubeSchedulerArgs(t *testing.T) {
	agent := &fakeAgent{scores: rankScores}
	raw := `{"address":"` + serve(t, agent) + `","insecure":true,"deadline":"200ms"}`
	p, err := New(context.Background(), &runtime.Unknown{Raw: []byte(raw), ContentType: runtime.ContentTypeJSON}, nil)
	if err != nil {
		t.Fatal(err)
	}
	pl := p.(*Plugin)
	defer pl.Close()
	if pl.Name() != Name || pl.args.Deadline.Duration != 200*time.Millisecond {
		t.Fatalf("plugin %s with args %s", pl.Name(), pl.args)
	}
	if got, _ := schedule(t, pl, makePod("p", 1000, 2048, 0, nil), cluster()); got["n1"] != 100 {
		t.Errorf("scores %v", got)
	}
	if _, err := New(context.Background(), &runtime.Unknown{Raw: []byte(`{"address":""}`)}, nil); err == nil {
		t.Error("New accepted args without an address")
	}
}

// ---- mutual TLS -------------------------------------------------------------------------------

type pki struct {
	dir                         string
	caFile, certFile, keyFile   string // the CA and the scheduler's client pair
	serverCert                  tls.Certificate
	clientCAs                   *x509.CertPool
	otherCertFile, otherKeyFile string // a client pair from another CA
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func newCA(t *testing.T, cn string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

func issue(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey, cn string, server bool) ([]byte, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.DNSNames = []string{"fedsched-agent"}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return der, key
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	dir := t.TempDir()
	p := &pki{dir: dir, caFile: filepath.Join(dir, "ca.crt"), certFile: filepath.Join(dir, "tls.crt"),
		keyFile: filepath.Join(dir, "tls.key"), otherCertFile: filepath.Join(dir, "other.crt"),
		otherKeyFile: filepath.Join(dir, "other.key")}
	ca, caKey := newCA(t, "fedsched test CA")
	writePEM(t, p.caFile, "CERTIFICATE", ca.Raw)
	p.clientCAs = x509.NewCertPool()
	p.clientCAs.AddCert(ca)

	der, key := issue(t, ca, caKey, "scheduler", false)
	writePEM(t, p.certFile, "CERTIFICATE", der)
	kder, _ := x509.MarshalPKCS8PrivateKey(key)
	writePEM(t, p.keyFile, "PRIVATE KEY", kder)

	sder, skey := issue(t, ca, caKey, "fedsched-agent", true)
	p.serverCert = tls.Certificate{Certificate: [][]byte{sder}, PrivateKey: skey}

	other, otherKey := newCA(t, "another CA")
	oder, okey := issue(t, other, otherKey, "intruder", false)
	writePEM(t, p.otherCertFile, "CERTIFICATE", oder)
	okder, _ := x509.MarshalPKCS8PrivateKey(okey)
	writePEM(t, p.otherKeyFile, "PRIVATE KEY", okder)
	return p
}

func TestMutualTLS(t *testing.T) {
	p := newPKI(t)
	agent := &fakeAgent{scores: rankScores}
	creds := credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{p.serverCert}, ClientCAs: p.clientCAs,
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12,
	})
	addr := serve(t, agent, grpc.Creds(creds))
	deadline := &metav1.Duration{Duration: MaxDeadline} // a first handshake on a loaded machine
	tests := []struct {
		name   string
		tls    TLSArgs
		reason string
	}{
		{"the scheduler's pair from the agent's CA", TLSArgs{CAFile: p.caFile, CertFile: p.certFile, KeyFile: p.keyFile, ServerName: "fedsched-agent"}, ""},
		{"server name defaulted from the address (IP SAN)", TLSArgs{CAFile: p.caFile, CertFile: p.certFile, KeyFile: p.keyFile}, ""},
		{"a client certificate of another CA", TLSArgs{CAFile: p.caFile, CertFile: p.otherCertFile, KeyFile: p.otherKeyFile, ServerName: "fedsched-agent"}, reasonUnavailable},
		{"a server name the certificate lacks", TLSArgs{CAFile: p.caFile, CertFile: p.certFile, KeyFile: p.keyFile, ServerName: "elsewhere"}, reasonUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ta := tt.tls
			pl := newPlugin(t, &Args{Address: addr, TLS: &ta, Deadline: deadline})
			cs := framework.NewCycleState()
			pl.PreScore(context.Background(), cs, makePod("p", 1000, 2048, 0, nil), cluster())
			s, err := getState(cs)
			if err != nil {
				t.Fatal(err)
			}
			if s.reason != tt.reason {
				t.Errorf("fallback reason %q, want %q", s.reason, tt.reason)
			}
		})
	}
}

func TestTLSFilesCheckedAtStart(t *testing.T) {
	p := newPKI(t)
	bad := filepath.Join(p.dir, "garbage.pem")
	if err := os.WriteFile(bad, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		tls  TLSArgs
	}{
		{"missing CA", TLSArgs{CAFile: filepath.Join(p.dir, "nope"), CertFile: p.certFile, KeyFile: p.keyFile}},
		{"CA without a certificate", TLSArgs{CAFile: bad, CertFile: p.certFile, KeyFile: p.keyFile}},
		{"missing key", TLSArgs{CAFile: p.caFile, CertFile: p.certFile, KeyFile: filepath.Join(p.dir, "nope")}},
		{"key of another certificate", TLSArgs{CAFile: p.caFile, CertFile: p.certFile, KeyFile: p.otherKeyFile}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ta := tt.tls
			a, err := DecodeArgs(&Args{Address: "127.0.0.1:1", TLS: &ta})
			if err != nil {
				t.Fatal(err)
			}
			if pl, err := NewWithArgs(context.Background(), a); err == nil {
				pl.Close()
				t.Fatal("NewWithArgs accepted unusable TLS files")
			}
		})
	}
}

func TestClientCertificateReloaded(t *testing.T) {
	p := newPKI(t)
	kp := &keyPair{certFile: p.certFile, keyFile: p.keyFile}
	first, err := kp.get()
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := kp.get(); again != first {
		t.Error("unchanged files were loaded again")
	}
	// renewal: another pair in place of the first (mtime moved forward)
	for _, f := range [][2]string{{p.otherCertFile, p.certFile}, {p.otherKeyFile, p.keyFile}} {
		b, err := os.ReadFile(f[0])
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f[1], b, 0o600); err != nil {
			t.Fatal(err)
		}
		later := time.Now().Add(time.Minute)
		if err := os.Chtimes(f[1], later, later); err != nil {
			t.Fatal(err)
		}
	}
	renewed, err := kp.get()
	if err != nil {
		t.Fatal(err)
	}
	if renewed == first || string(renewed.Certificate[0]) == string(first.Certificate[0]) {
		t.Error("the renewed pair was not loaded")
	}
	// a half-written renewal keeps the last good pair
	if err := os.WriteFile(p.keyFile, []byte("truncated"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(p.keyFile, time.Now().Add(2*time.Minute), time.Now().Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if kept, err := kp.get(); err != nil || kept != renewed {
		t.Errorf("a broken key file: got %v, %v; want the last good pair", kept, err)
	}
}
