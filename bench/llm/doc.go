// Package llm holds a scenario test that puts egress and its peers in front
// of the same fake LLM provider (internal/fakellm), limited in requests and
// tokens per minute, as a fleet of simulated pods, and measures at the
// provider what each client does: the 429s it draws, the tokens it gets
// accepted, and how much of the binding limit (the tokens) it uses.
//
//	cd bench && go test -run TestLLMScenario -v ./llm/ -count=1
//
// It takes about a minute and is skipped under -short. With
// EGRESS_LLM_OUT=path the table is also written to path, as markdown.
// Everything is in _test.go files.
package llm
