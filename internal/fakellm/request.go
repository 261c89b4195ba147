package fakellm

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
)

// maxBody is the most of a request body the provider reads.
const maxBody = 4 << 20

// request is what the provider needs of a valid request.
type request struct {
	model        string
	input        int // input tokens, by InputTokens' rule
	maxTokens    int // at least 1
	stream       bool
	includeUsage bool // OpenAI's stream_options.include_usage
}

// invalid is why a request was not valid: the status and the message of
// the error body.
type invalid struct {
	status int
	msg    string
}

// parse reads and checks r's body for the endpoint of d; an OpenAI request
// without max_tokens gets defMax.
func parse(d dialect, r *http.Request, defMax int) (request, *invalid) {
	if r.Method != http.MethodPost {
		return request{}, &invalid{http.StatusMethodNotAllowed, "Method " + r.Method + " not allowed: use POST."}
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		return request{}, &invalid{http.StatusBadRequest, "Could not read the request body."}
	}
	if len(body) > maxBody {
		return request{}, &invalid{http.StatusRequestEntityTooLarge, "The request body is too large."}
	}
	var w wireRequest
	if err := json.Unmarshal(body, &w); err != nil {
		msg := "We could not parse the JSON body of your request."
		if errors.Is(err, errContent) {
			msg = "Invalid message: " + err.Error() + "."
		}
		return request{}, &invalid{http.StatusBadRequest, msg}
	}
	req := request{
		model:        w.Model,
		input:        w.inputTokens(),
		stream:       w.Stream,
		includeUsage: w.StreamOptions != nil && w.StreamOptions.IncludeUsage,
	}
	switch {
	case w.Model == "":
		return request{}, &invalid{http.StatusBadRequest, "model: a model is required."}
	case len(w.Messages) == 0:
		return request{}, &invalid{http.StatusBadRequest, "messages: at least one message is required."}
	}
	maxTokens := d.maxTokens(&w, defMax)
	if maxTokens == nil {
		return request{}, &invalid{http.StatusBadRequest, "max_tokens: Field required."}
	}
	if *maxTokens < 1 {
		return request{}, &invalid{http.StatusBadRequest, "max_tokens: must be at least 1."}
	}
	req.maxTokens = *maxTokens
	return req, nil
}
