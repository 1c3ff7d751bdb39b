// Command genproto generates the Go stubs of common/proto/decision.proto without protoc.
//
// It compiles the .proto with github.com/bufbuild/protocompile (a pure-Go protobuf compiler),
// hands the resulting descriptors to protoc-gen-go and protoc-gen-go-grpc over their plugin
// protocol (a CodeGeneratorRequest on stdin, a CodeGeneratorResponse on stdout), exactly as
// protoc would, and writes the files they return. Run it through gen.sh next to it:
//
//	bash agent/scoreplugin/hack/genproto/gen.sh          # regenerate pkg/decisionpb/
//	bash agent/scoreplugin/hack/genproto/gen.sh --check  # fail if the committed stubs are stale
//
// The proto is compiled under the virtual path fedsched/common/proto/decision.proto, the path
// scripts/gen_proto.sh gives the Python modules, so both sides register the same file name.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/bufbuild/protocompile"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/pluginpb"
)

const virtualPath = "fedsched/common/proto/decision.proto"

func main() {
	protoFile := flag.String("proto", "", "path of common/proto/decision.proto")
	outDir := flag.String("out", "", "root of the fedsched.dev/scoreplugin module")
	goPkg := flag.String("go-package", "fedsched.dev/scoreplugin/pkg/decisionpb", "Go import path of the stubs")
	module := flag.String("module", "fedsched.dev/scoreplugin", "module prefix stripped from output paths")
	genGo := flag.String("protoc-gen-go", "", "protoc-gen-go executable")
	genGrpc := flag.String("protoc-gen-go-grpc", "", "protoc-gen-go-grpc executable")
	check := flag.Bool("check", false, "do not write: exit 1 if a generated file differs from the one on disk")
	flag.Parse()
	if *protoFile == "" || *outDir == "" || *genGo == "" || *genGrpc == "" {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(*protoFile, *outDir, *goPkg, *module, *genGo, *genGrpc, *check); err != nil {
		fmt.Fprintln(os.Stderr, "genproto:", err)
		os.Exit(1)
	}
}

func run(protoFile, outDir, goPkg, module, genGo, genGrpc string, check bool) error {
	src, err := os.ReadFile(protoFile)
	if err != nil {
		return err
	}
	compiler := protocompile.Compiler{
		Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
			Accessor: func(path string) (io.ReadCloser, error) {
				if path == virtualPath {
					return io.NopCloser(bytes.NewReader(src)), nil
				}
				return nil, os.ErrNotExist
			},
		}),
		SourceInfoMode: protocompile.SourceInfoStandard, // comments go into the stubs
	}
	files, err := compiler.Compile(context.Background(), virtualPath)
	if err != nil {
		return fmt.Errorf("compiling %s: %w", protoFile, err)
	}

	// every file the request needs, dependencies first (as protoc sends them)
	var all []*descriptorpb.FileDescriptorProto
	seen := map[string]bool{}
	var add func(fd protoreflect.FileDescriptor)
	add = func(fd protoreflect.FileDescriptor) {
		if seen[fd.Path()] {
			return
		}
		seen[fd.Path()] = true
		imports := fd.Imports()
		for i := 0; i < imports.Len(); i++ {
			add(imports.Get(i).FileDescriptor)
		}
		all = append(all, protodesc.ToFileDescriptorProto(fd))
	}
	add(files[0])

	param := fmt.Sprintf("M%s=%s,module=%s", virtualPath, goPkg, module)
	req := &pluginpb.CodeGeneratorRequest{
		FileToGenerate: []string{virtualPath},
		Parameter:      proto.String(param),
		ProtoFile:      all,
	}
	stale := 0
	for _, plugin := range []string{genGo, genGrpc} {
		resp, err := runPlugin(plugin, req)
		if err != nil {
			return err
		}
		for _, f := range resp.GetFile() {
			path := filepath.Join(outDir, filepath.FromSlash(f.GetName()))
			content := []byte(f.GetContent())
			if check {
				old, err := os.ReadFile(path)
				if err != nil || !bytes.Equal(old, content) {
					fmt.Fprintf(os.Stderr, "genproto: %s is not up to date\n", path)
					stale++
				}
				continue
			}
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return err
			}
			if err := os.WriteFile(path, content, 0o644); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "genproto: wrote %s\n", path)
		}
	}
	if stale > 0 {
		return fmt.Errorf("%d generated file(s) differ: run hack/genproto/gen.sh", stale)
	}
	return nil
}

func runPlugin(plugin string, req *pluginpb.CodeGeneratorRequest) (*pluginpb.CodeGeneratorResponse, error) {
	in, err := proto.Marshal(req)
	if err != nil {
		return nil, err
	}
	var out, stderr bytes.Buffer
	cmd := exec.Command(plugin)
	cmd.Stdin = bytes.NewReader(in)
	cmd.Stdout = &out
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s: %w: %s", plugin, err, strings.TrimSpace(stderr.String()))
	}
	resp := &pluginpb.CodeGeneratorResponse{}
	if err := proto.Unmarshal(out.Bytes(), resp); err != nil {
		return nil, fmt.Errorf("%s: bad response: %w", plugin, err)
	}
	if resp.Error != nil {
		return nil, fmt.Errorf("%s: %s", plugin, resp.GetError())
	}
	return resp, nil
}
